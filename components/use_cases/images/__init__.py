"""Image classification: which shape does a photo show?

Images in object storage, one folder per class (`span-N/<class>/<name>.jpg`), a convolutional
network trained on them, a served model that takes the encoded image (TF Serving's
`{"b64": ...}`). Everything specific to this use case lives in this folder and in
schemas/images/:

- preprocessing.py: tf.Transform's `preprocessing_fn` (the image passes through encoded) and
  `decode_images`, the one place images are decoded and resized, for training and serving;
- model.py: `build_model`, a small convolutional network or EfficientNetV2 (a hyperparameter);
- data.py: the generator of spans (coloured shapes over noise, JPEG and PNG);
- this file: what the product reads of the use case (USE_CASE), light enough for the CLI.

The classes are the first span's folder names, recorded for the model
(components/steps/image_input.py); `class_names` in the config changes them.
"""

from pathlib import Path

from components.base.use_case import IMAGE_FOLDERS, UseCase

USE_CASE = UseCase(
    name="images",
    label_key="label",
    class_names=(),  # from the data: the class folders
    slice_keys=("label_name",),
    sample_columns=("label_name", "path"),
    schema_path=Path(__file__).resolve().parents[3] / "schemas" / "images" / "schema.pbtxt",
    preprocessing_fn=f"{__name__}.preprocessing.preprocessing_fn",
    build_model=f"{__name__}.model.build_model",
    generate_span=f"{__name__}.data.generate_span",
    search_space=f"{__name__}.model.search_space",
    hyperparameters={
        "network": "small_cnn",
        "image_size": 32,
        "filters": [16, 32, 64],
        "dropout": 0.2,
        "augment": True,
    },
    config_defaults={
        "pipeline_name": "image-classes",
        "model_name": "image-classes",
        "data_root": "s3://tfx-pipeline/data/images",
        "rows_per_span": 1200,
        "train_steps": 900,
        "eval_steps": 20,
        "epochs": 3,
        "batch_size": 32,
        "learning_rate": 0.003,
        "min_auc": 0.8,
        "min_accuracy": 0.6,
        # A model for phones beside each served version: float16 weights halve its size, and
        # phones' GPU delegates compute in float16 anyway.
        "export_tflite": 1,
        "tflite_quantization": "float16",
    },
    prepare_batch=f"{__name__}.preprocessing.prepare_batch",
    quality_metric="accuracy",
    # What GPU Trainers are for: EfficientNetV2-B0 at its own input size.
    gpu_check_hyperparameters={"network": "efficientnetv2-b0", "image_size": 224},
    input_format=IMAGE_FOLDERS,
    input_options={"min_side": 16, "max_side": 4096},
)
