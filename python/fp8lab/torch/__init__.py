"""Quantized training of PyTorch models on fp8lab's C++ library (docs/python.md).

    model = fp8lab.torch.quantize_model(model, "resnet32-152")   # or a recipe file
    scaler = fp8lab.torch.LossScaler("backoff", recipe="resnet32-152")
    ...
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
"""
from ._functional import LayerState, QuantContext, context, conv, conv2d, layer, linear, matmul  # noqa: F401
from ._modules import LayerSlot, QuantConv2d, QuantLinear, QuantMatmul, QuantMultiheadAttention  # noqa: F401
from ._convert import QuantState, quant_state, quantize_model  # noqa: F401
from ._scaling import LossScaler  # noqa: F401
from ._record import RunRecorder  # noqa: F401
from ._dispatch import QuantizedProgram, quantized  # noqa: F401

__all__ = [
    "LayerState", "QuantContext", "context", "layer", "linear", "conv", "conv2d", "matmul", "QuantLinear", "QuantConv2d",
    "QuantMatmul", "QuantMultiheadAttention", "LayerSlot", "QuantState", "quant_state", "quantize_model",
    "LossScaler", "RunRecorder", "QuantizedProgram", "quantized",
]
