"""The step-wise LLMEngine and the batch LLM front end."""
