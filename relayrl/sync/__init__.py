"""Weight sync: learner -> rollout engine, with a policy version counter."""
