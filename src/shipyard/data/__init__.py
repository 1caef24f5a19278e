"""Readers for SageMaker data channels, imported by training scripts.

``shipyard.data.pipe`` holds the framework-free part (finding a channel's next epoch
FIFO, the epoch state, TFRecord / RecordIO / TextLine record splitting);
``shipyard.data.tensorflow.PipeModeDataset`` and ``shipyard.data.torch.PipeDataset``
wrap it for tf.data and torch. Nothing here imports the control plane or the agent.
"""
