"""Device-side state and execution: KV tensors, step inputs, the model runner."""
