"""Generated gRPC code of fireflyer protos; do not edit (scripts/gen_protos.py)."""
