"""The training loop and what one step runs: the loop, the update, guards, setup, memory, the demo."""
