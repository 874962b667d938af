"""redrive's AWS adapters (SQS; clients for S3, DynamoDB and STS) and the one translation of
AWS errors into one-line messages (:mod:`redrive.aws.errors`)."""
