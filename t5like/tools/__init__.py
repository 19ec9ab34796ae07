"""Developer tools: vocabulary builder, embedded-data generator and other one-off CLIs."""
