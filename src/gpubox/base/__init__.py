"""Layer 1, leaves: host paths and unit names, errors, templates, GPU generations, kernels.

- ``layout``: every host path, unit name and port gpubox owns;
- ``errors``: the deploy's exceptions;
- ``rendering``: the package's templates and files (``render``, ``as_file``);
- ``compat``: GPU generations, their compute capabilities and last driver branches;
- ``kernels``: the kernel commands and their parsers.
"""
