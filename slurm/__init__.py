"""Glue between legato and SLURM (submitit, sbatch, the local test cluster)."""
