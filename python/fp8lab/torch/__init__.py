"""Quantized training of PyTorch models on the C++ library (docs/python.md)."""
