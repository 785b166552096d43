"""Layer 2, pure knowledge: rules that need no host's configuration; no I/O.

One subject a module: ``reads`` (the reads of a host the deploy and the checks share),
``vllm_rules``, ``torch_archs``, ``openai_shape``, ``answer_sanity``, ``watchdog`` (also the
program the box's watchdog timer runs), ``exporter_label``, ``secure_boot``, ``users``,
``apt_versions``, ``panel``, ``modelscope``, ``driver_lifecycle``. docs/design.md says what
each one is.
"""
