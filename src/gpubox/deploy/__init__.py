"""Layer 11, entry points: the deploy files pyinfra runs from the package.

``full.py`` (every stage, as ``gpubox deploy`` runs it) and ``burnin.py`` (``gpubox
burnin``). A checkout's ``deploy/*.py`` are thin files that run the same stages.
"""
