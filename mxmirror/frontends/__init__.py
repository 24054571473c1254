"""Front ends: the bind hook, the start-up hook, the command line and its demo."""
