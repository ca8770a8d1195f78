"""Bundled demo models (dense Llama, Mixtral MoE, BitNet b1.58) and the script that trains them.

`python -m edgellm.models.demo.train --model all` rebuilds them from the Python standard library's own
source (PSF-2.0), offline; see README.md in each model folder for the numbers.
"""
