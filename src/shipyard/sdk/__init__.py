"""The user's Python API, mirroring the SageMaker Python SDK v2. Builds JobSpecs only."""
