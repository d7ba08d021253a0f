"""The Beam preprocessing job: corpus -> log-mel once -> statistics -> filter -> pad -> TFRecord shards."""
