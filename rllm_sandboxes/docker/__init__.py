"""The `docker` sandbox provider (`--sandbox docker`, extra rllm[docker]): task images built from
`environment/Dockerfile` and run as containers through the docker SDK. See provider.py."""
