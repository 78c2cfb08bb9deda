"""The `modal` sandbox provider (`--sandbox modal`, extra rllm[modal]): see provider.py."""
