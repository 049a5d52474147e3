"""Experiments on a model: the papers' analyses that load, sample from or train a policy, and their pictures
(docs/methods.md §8b, §8e). The pure measures they build on (functions of counts, tensors and strings) are in
`explorl.analysis`.

- `probes`: the papers' probes (`explorl probe`), some of which run the training loop's update step.
- `impact`: token impact by replacement (STILL, eq. 5 and 6).
- `gradients`: token gradient norms at the output layer in closed form (STILL, eq. 4).
- `plots`: one PNG per `explorl probe` result.

Nothing is imported here: `import explorl.experiments.probes` (which loads the loop) only when it is used.
"""
