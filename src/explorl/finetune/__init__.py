"""Supervised fine-tuning: SFT, exploration-aware rejection-sampling fine-tuning (RFT), bootstrap."""
