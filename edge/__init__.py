"""Edge packaging: ONNX export, parity and latency checks, Jetson targets and policy bundles.

Nothing here imports from ``stages`` or ``flows``; heavy libraries (torch, onnx, onnxruntime)
are imported inside the functions that use them, so importing any module is cheap.
"""
