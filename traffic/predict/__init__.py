"""What a workload should take on a fabric, with no fabric built (pure): connections' paths as
the switches route them (``router``), links shared max-min fairly step by step (``flowsim``) or
rank by rank (``progress``), ECMP's expectation over hash draws (``pathdraws``), TCP's uneven
shares (``shares``), the line-rate bound (``ideal``), and the prediction of every collective
and training iteration (``predictor``, ``iterations``)."""
