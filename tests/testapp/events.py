from django_rmq_retry import Topic

work = Topic("test.work")  # two receivers: alpha and beta (siblings)
other = Topic("test.other")  # one receiver: gamma
