#!/bin/bash
echo building
