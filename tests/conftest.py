import os
import signal

import numpy as np
import pytest

# tests/fuzz/ holds the atheris target, run by hand or by tests/fuzz/run.sh, not by pytest.
collect_ignore = ["fuzz"]

# A suite started in the background of a non-interactive shell (`cmd &`, as a CI script may
# start it) inherits SIGINT ignored, and Python then leaves it ignored: the Ctrl-C tests (and
# the commands they start, which inherit it) would never see one. They test the command as a
# terminal runs it, so Ctrl-C gets Python's own handler back here, in every worker.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass
else:
    # A modest default keeps the suite fast; BLOCKQUANT_HYPOTHESIS_EXAMPLES=5000 digs deeper.
    settings.register_profile(
        "blockquant",
        max_examples=int(os.environ.get("BLOCKQUANT_HYPOTHESIS_EXAMPLES", "300")),
        deadline=None,  # the first call of a kernel builds the thread pool
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    settings.load_profile("blockquant")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture(params=[1, 2], ids=["1T", "2T"])
def threads(request):
    """The core's thread count for one test: one, then two (the thread count restored after)."""
    import blockquant as bq

    before = bq.get_num_threads()
    bq.set_num_threads(request.param)
    yield request.param
    bq.set_num_threads(before)
