"""Taxi tips: will a Chicago-style taxi trip's tip be more than 20 % of the fare?

Tabular data (one CSV row per trip), a binary label, a small dense network. Everything specific
to this data set and model lives in this folder and in schemas/taxi/:

- features.py: the raw columns, the label and the feature settings;
- preprocessing.py: tf.Transform's `preprocessing_fn`;
- model.py: `build_model`, the Keras model over the transformed features;
- data.py: the generator of spans (`make run` on an empty data root, `add-span`, the tests);
- this file: what the product reads of the use case (USE_CASE), light enough for the CLI.
"""

from pathlib import Path

from components.base.use_case import UseCase
from components.use_cases.taxi import features

USE_CASE = UseCase(
    name="taxi",
    label_key=features.LABEL_KEY,
    class_names=("small tip", "big tip"),
    slice_keys=(features.SLICE_KEY,),
    sample_columns=("payment_type", "fare", "trip_miles"),
    schema_path=Path(__file__).resolve().parents[3] / "schemas" / "taxi" / "schema.pbtxt",
    preprocessing_fn=f"{__name__}.preprocessing.preprocessing_fn",
    build_model=f"{__name__}.model.build_model",
    generate_span=f"{__name__}.data.generate_span",
    search_space=f"{__name__}.model.search_space",
    hyperparameters={"hidden_units": [64, 32], "embedding_dim": 8},
    config_defaults={
        "pipeline_name": "taxi-tips",
        "model_name": "taxi-tips",
        "data_root": "s3://tfx-pipeline/data/taxi-trips",
        "min_auc": 0.75,
        "min_accuracy": 0.7,
    },
)
