"""Symbolic network definitions used to reproduce the paper's memory measurements."""
