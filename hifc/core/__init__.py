"""Torch-free bookkeeping: sequences, the GPU block pool, the KV manager and the scheduler."""
