"""explorl: reinforcement learning with verifiable rewards for language models, built around exploration."""

__version__ = "0.1.0"
