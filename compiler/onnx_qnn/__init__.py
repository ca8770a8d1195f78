"""The android-npu backend of the compiler: the model's forward as static ONNX prefill-chunk graphs per group of
layers (graph.py), quantized for the Hexagon HTP (quantize.py) and prepared per SoC as EPContext binaries
(epcontext.py); package.py writes them into a package's npu/ folder."""
