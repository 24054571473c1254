"""The MXNet side: Symbol -> Graph, template learning, child processes, MXNet's figure,
free device memory."""
