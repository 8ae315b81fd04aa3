"""The jobs the operators submit with spark-submit and the CLI runs in-process. They never import Airflow."""
