"""The `tinker` training backend: the update and the sampling run on Thinking Machines' Tinker service."""
