"""The retrain-and-deploy cycle (`tracemill cycle`): mine what is new, decide whether to train, train, measure the
candidate against the active reviser, deploy it only when the gate passes, and record every step in `cycles`.

    from tracemill.cycle import CycleSettings, run_cycle, train_config
    record = run_cycle(CycleSettings(store="sqlite:///t.db", work=Path("cycles"), base_model="tiny/model",
                                     train=train_config({"grpo": {"max_steps": 4}})), progress=print)
"""

from tracemill.cycle.record import CycleRecord, history
from tracemill.cycle.run import CycleBusy, CycleError, run_cycle
from tracemill.cycle.settings import CycleSettings, Decision, Gate, Mining, load_settings, train_config

__all__ = ["CycleBusy", "CycleError", "CycleRecord", "CycleSettings", "Decision", "Gate", "Mining", "history",
           "load_settings", "run_cycle", "train_config"]
