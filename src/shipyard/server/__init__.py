"""``shipyard server``: SageMaker's own API on this machine.

One HTTP endpoint answers the services the SageMaker Python SDK v2 and boto3 call --
``sagemaker``, ``sagemaker-runtime``, ``logs``, ``s3``, ``sts``, ``iam`` -- routed by the
service name in the SigV4 credential scope (as AWS emulators do). Requests become the
same JobSpecs and endpoint records that shipyard's SDK and CLI make, so ``shipyard jobs``
shows what a notebook started through boto3.

Modules: ``app`` (HTTP server, routing, auth), ``sigv4`` (credential scope and signature
check), ``errors`` (SageMaker's error shapes), ``s3`` (the on-disk object store and its
REST API), ``training``, ``hosting``, ``transform`` (the sagemaker service), ``runtime``
(InvokeEndpoint), ``logs`` (CloudWatch Logs), ``identity`` (STS/IAM), ``images`` (image
URI -> framework), ``records`` (what the server keeps beside the job store), ``env``
(``shipyard server env``).
"""
