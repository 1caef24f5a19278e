"""The post-import hook of shipyard's TensorFlow hooks: :mod:`shipyard.runtime.postimport`.

It moved to the runtime floor so the DDP step-timing hook (``shipyard/ddp``, beside this
package) uses the same one; the TF hooks keep importing it from here.
"""

from shipyard.runtime.postimport import Hook, when_imported

__all__ = ["Hook", "when_imported"]
