"""MLflow model-from-code for the serving tests: a keyword rule with the project's pyfunc interface.

``predict`` takes a DataFrame with a ``text`` column (or a list of strings) and returns a DataFrame
with ``prediction`` (one of the configured labels) and ``score``, one row per text, as every
version the pipeline registers does. ``model_config``:

- ``keywords``: ``{keyword: label}``, the first keyword found in the lower-cased text decides;
- ``default``: the label of a text with no keyword;
- ``predict_delay_s``: seconds each predict call sleeps (a model's fixed cost per call, so that
  batching and in-flight requests can be seen);
- ``load_delay_s``: seconds loading takes (a swap that is not instant).
"""

from __future__ import annotations

import time

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class KeywordModel(PythonModel):
    def load_context(self, context):
        config = context.model_config or {}
        self.keywords = dict(config.get("keywords", {}))
        self.default = str(config["default"])
        self.predict_delay_s = float(config.get("predict_delay_s", 0.0))
        time.sleep(float(config.get("load_delay_s", 0.0)))

    def predict(self, context, model_input, params=None):
        texts = [str(t) for t in (model_input["text"] if hasattr(model_input, "columns") else model_input)]
        if self.predict_delay_s:
            time.sleep(self.predict_delay_s)
        predictions, scores = [], []
        for text in texts:
            label = next((lab for key, lab in self.keywords.items() if key in text.lower()), None)
            predictions.append(label or self.default)
            scores.append(0.9 if label else 0.5)
        return pd.DataFrame({"prediction": predictions, "score": scores})


mlflow.models.set_model(KeywordModel())
