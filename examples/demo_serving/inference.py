"""Pre- and post-processing for the demo's CIFAR-10 endpoint (SageMaker's TF Serving
container contract: input_handler / output_handler).

JSON and JSON lines pass through (TF Serving's ``instances``); a CSV row is one image,
3072 pixel values (32x32x3, 0..1), reshaped here. The answer is the most likely class
per image with its probability.
"""

import json

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def input_handler(data, context):
    if context.request_content_type == "text/csv":
        rows = [[float(v) for v in ln.split(",")] for ln in data.read().decode().splitlines() if ln]
        images = [
            [[r[(y * 32 + x) * 3 : (y * 32 + x) * 3 + 3] for x in range(32)] for y in range(32)]
            for r in rows
        ]
        return json.dumps({"instances": images})
    if context.request_content_type == "application/jsonlines":
        lines = [json.loads(ln) for ln in data.read().decode().splitlines() if ln.strip()]
        return json.dumps({"instances": lines})
    body = json.loads(data.read())
    return json.dumps(body if isinstance(body, dict) else {"instances": body})


def output_handler(response, context):
    if response.status_code != 200:
        raise ValueError(response.content.decode())
    scores = json.loads(response.content)["predictions"]
    best = [max(range(len(s)), key=s.__getitem__) for s in scores]
    answer = [{"class": CLASSES[b], "probability": round(s[b], 4)} for b, s in zip(best, scores)]
    return json.dumps({"predictions": answer}), "application/json"
