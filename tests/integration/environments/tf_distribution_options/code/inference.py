"""The notebook's inference.py: TF Serving pre/post-processing (an image in, the predictions
out), copied into the model by the training scripts."""

import io
import json
from collections import namedtuple

import numpy as np
from PIL import Image

Context = namedtuple(
    "Context",
    "model_name, model_version, method, rest_uri, grpc_uri, "
    "custom_attributes, request_content_type, accept_header",
)


def input_handler(data, context):
    """Pre-process request input before it is sent to TensorFlow Serving REST API."""
    if context.request_content_type == "application/x-image":
        image_as_bytes = io.BytesIO(data.read())
        image = Image.open(image_as_bytes)
        instance = np.expand_dims(image, axis=0)
        return json.dumps({"instances": instance.tolist()})
    _return_error(
        415, 'Unsupported content type "{}"'.format(context.request_content_type or "Unknown")
    )


def output_handler(data, context):
    """Post-process TensorFlow Serving output before it is returned to the client."""
    if data.status_code != 200:
        raise Exception(data.content.decode("utf-8"))
    response_content_type = context.accept_header
    prediction = data.content
    return prediction, response_content_type


def _return_error(code, message):
    raise ValueError(f"Error: {str(code)}, {message}")
