"""`import hvd_lite.tensorflow.keras as hvd` in place of `import horovod.tensorflow.keras as hvd`:
the same module as hvd_lite.keras, for Keras 3 and for tf_keras (Keras 2) objects alike."""

from ...keras import *  # noqa: F401,F403
from ...keras import __all__, callbacks, elastic  # noqa: F401
