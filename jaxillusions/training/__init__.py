"""Training a population of seeds as one program: the loop, the vmapped step, the
objective, the original model's evaluation."""
