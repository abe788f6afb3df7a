"""The tuner: cost model fitted from phase measurements and acceptance, and live tuning over a backend.

Pure logic lives in settings, observations, linfit, acceptance, cost_model and export (SGLang's
adaptive policy is probes.adaptive_policy, shared with the engine); `live` drives a backend step by
step on the session clock. Nothing here imports textual or torch.
"""

from tuner.tuning.cost_model import (CostModel, Prediction, WhatIf, best, fit_cost_model,
                                     fit_from_records, recommend)
from tuner.tuning.settings import Setting, settings_space

__all__ = ["CostModel", "Prediction", "WhatIf", "Setting", "best", "fit_cost_model",
           "fit_from_records", "recommend", "settings_space"]
