"""What servesweep knows of SGLang: its launch flags per version, model and GPU profiles, memory arithmetic. Runs in any process."""
