"""OpenCL backend of the compiler: GPU kernel definitions (ops.py) and the package build (build.py)."""
