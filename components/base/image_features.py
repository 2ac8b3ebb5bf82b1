"""The features of an image example, as ExampleGen writes them for a span of images in class
folders (components/steps/image_input.py) and an image use case's schema and model read them.
Light: names only."""

IMAGE_KEY = "image"  # the file's encoded bytes, as served (TF Serving's {"b64": ...})
LABEL_KEY = "label"  # the class's index in the model's classes
LABEL_NAME_KEY = "label_name"  # the class folder's name
HEIGHT_KEY, WIDTH_KEY, CHANNELS_KEY = "height", "width", "channels"
PATH_KEY = "path"  # the source file; ExampleGen splits train/eval by its hash
FEATURES = (IMAGE_KEY, LABEL_KEY, LABEL_NAME_KEY, HEIGHT_KEY, WIDTH_KEY, CHANNELS_KEY, PATH_KEY)
