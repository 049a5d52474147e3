"""Engines the loop samples with: explorl's own (`native`) and vLLM (`vllm`)."""
