"""``shipyard server``: SageMaker's own API on this machine.

One HTTP endpoint answers the services the SageMaker Python SDK v2 and boto3 call --
``sagemaker``, ``sagemaker-runtime``, ``logs``, ``s3``, ``sts``, ``iam`` -- routed by the
service name in the SigV4 credential scope (as AWS emulators do). Requests become the
same JobSpecs and endpoint records that shipyard's SDK and CLI make, so ``shipyard jobs``
shows what a notebook started through boto3.

Modules: ``app`` (routing and errors) over ``asgi`` (uvicorn: sockets, limits, the event
loop); ``guard`` (Host, Origin and the SigV4 check, ``sigv4``) with ``credentials`` (the
server's key); ``contract`` (operations and input shapes from botocore's service models);
``errors`` (SageMaker's error shapes); ``s3_api`` (S3's REST API, with ``s3_checks``) over
``objects`` (the on-disk object store); ``training``, ``hosting``, ``transform_jobs`` (the
sagemaker service); ``invocations`` (sagemaker-runtime's InvokeEndpoint); ``logs``
(CloudWatch Logs) and ``monitoring`` (CloudWatch metrics); ``identity`` (STS/IAM);
``images`` (image URI -> framework); ``records`` (what the server keeps beside the job
store); ``env`` (``shipyard server env``); ``compose`` (the SDK's local mode without Docker).
Names never repeat another package's: ``invocations`` is not ``shipyard.runtime``,
``transform_jobs`` not ``shipyard.serving.transform``, ``s3_api`` not ``shipyard.storage.s3``.
"""
