"""The paper's claims as runnable experiments (specs in configs/experiments/, CLI in __main__)."""
