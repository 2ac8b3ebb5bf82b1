"""The raw columns of the taxi-trip data set and the names of their transformed features.

One place for these names: the data generator, the curated schema, `preprocessing_fn`,
the model and the evaluation config all refer to them.
"""

LABEL_KEY = "big_tipper"  # 1 when the tip is more than 20 % of the fare

# Raw CSV columns, in file order (label last).
TIMESTAMP_KEY = "trip_start_timestamp"  # int, Unix seconds (UTC)
NUMERIC_FEATURE_KEYS = ["trip_miles", "trip_seconds", "fare"]
CATEGORICAL_STRING_KEYS = ["payment_type", "company"]  # company may be missing
CATEGORICAL_INT_KEYS = ["pickup_community_area"]  # 1..77, may be missing
RAW_COLUMNS = (
    [TIMESTAMP_KEY]
    + NUMERIC_FEATURE_KEYS
    + CATEGORICAL_STRING_KEYS
    + CATEGORICAL_INT_KEYS
    + [LABEL_KEY]
)

# Transformed features (the Trainer's inputs).
BUCKET_FEATURE_KEY = "trip_miles"  # also bucketized into quantiles
NUM_BUCKETS = 10
VOCAB_SIZE = 50
OOV_SIZE = 1
COMMUNITY_AREAS = 78  # ids 0..77, 0 stands for missing
HOURS = 24
DAYS = 7

# Slice used by the Evaluator and shown in the summary.
SLICE_KEY = "payment_type"


def transformed_name(key: str) -> str:
    return f"{key}_xf"
