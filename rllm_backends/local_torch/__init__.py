"""The local torch backend: an in-process policy server (`serving/`) and trainer, on CPU or one GPU."""
