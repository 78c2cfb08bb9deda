#!/bin/bash
helper() { echo help; }
