"""Capture passes: the model as an ATen graph, its shapes and FLOPs, the nodes that carry
a gradient and the tensors autograd keeps."""
