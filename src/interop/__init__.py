"""The interop wing: models to and from other programs. A checkpoint exported as a transformers or
sentence-transformers directory (with its ONNX graphs), a published transformers model imported as a
checkpoint, and the ONNX graphs run as our models (scripts/export_hf.py, scripts/import_hf.py).
"""
