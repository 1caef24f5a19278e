"""SageMaker local mode without Docker: the ``docker`` the SDK calls, mapped onto shipyard.

The real SDK's local mode (``instance_type='local'`` / ``'local_gpu'``) writes a compose file
naming a SageMaker image per container, ``/opt/ml`` volumes, an environment and the command
``train`` or ``serve``, then runs ``docker compose -f FILE up``. ``shipyard server env`` puts a
directory holding ``docker`` and ``docker-compose`` stand-ins first on PATH; they run
``python -m shipyard.server.compose`` (:mod:`.command`), which reads the file
(:mod:`.project`) and runs it as a shipyard training job (:mod:`.train`) or endpoint
(:mod:`.serve`), so ``fit``, ``deploy``, ``predict`` and ``delete_endpoint`` behave as they
do with Docker. What cannot be mapped (a processing job, a custom entrypoint, an image that is
not a SageMaker framework image shipyard runs) is refused, naming it.
"""
