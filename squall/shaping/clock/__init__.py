"""A run's planned changes on the clock: started at the run's t = 0, sent at their due times at real-time priority."""
