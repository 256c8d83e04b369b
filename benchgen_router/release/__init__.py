"""Releasing a router: the folder users load (`folder`), its model card (`card`), the training report
stored beside it (`report`), and converting the original release's manifest + head weights (`convert`)."""
