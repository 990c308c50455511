"""The workflow around the stages: the DAG's trigger form and what each of its tasks does, a DAG
run's plan, every stage's command line, the local and Kubernetes runners, the cluster objects and
the MPIJob client.

No TensorFlow and no MLflow anywhere in this package: the Airflow image ships only it (and
`common`), and the stages run as command lines in the training environment or its image.
"""
